"""Between the runtime's processes: the typed messages and their frames, the socket
transport and shared memory, busy polling, the routing tables a request carries, and the
membership executors announce in the store. Used alike by the gateway and the workers."""
