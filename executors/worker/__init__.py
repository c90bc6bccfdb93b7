"""The executor process: hosting stages, gathering their inputs (races, relayed bodies,
batches), running them on worker threads under the watchdog, forwarding outputs; the
stage runner and fused chains, hedging and caches, GPU placement, and the in-process
interpreter. It never imports the gateway: they meet only in executors/wire."""
