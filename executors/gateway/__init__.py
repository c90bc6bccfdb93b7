"""The gateway: the HTTP edge (the app, its server and limits, OpenAPI and /docs), the
dispatcher that routes each request's stages to executors, placement, liveness, metrics
and the SLO figures. It never imports the worker: they meet only in executors/wire."""
