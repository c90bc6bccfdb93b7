"""Request and answer bodies to and from Tables: JSON and Arrow IPC, checked against a
flow's input schema, the same for the gateway and for an executor that parses a relayed
body. Imports nothing of the runtime's other parts."""
