"""What runs the runtime's parts as processes and what users call: the local cluster's
supervisor and gateway process, the standalone gateway, the client (``LocalCluster``,
``ClusterClient``, ``Deployment``), the CLI commands, configuration, autoscaling and SLO
profiling."""
