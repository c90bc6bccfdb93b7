"""``python -m k8s.gateway`` as a gateway pod runs it, for tests without a kubelet: the
pod's ServiceAccount token and the cluster's CA, which a pod finds mounted at the
in-cluster paths, are read from the files ``$TEST_SA_TOKEN_FILE`` and ``$TEST_SA_CA_FILE``
(KUBERNETES_SERVICE_HOST/PORT point at the API server, as in a pod).

    TEST_SA_TOKEN_FILE=... TEST_SA_CA_FILE=... python -m tests.k8s.incluster_gateway --port 8000 ...
"""

from __future__ import annotations

import os
import sys

import kubernetes.config.incluster_config as incluster

from k8s.gateway import main

if __name__ == "__main__":
    incluster.SERVICE_TOKEN_FILENAME = os.environ["TEST_SA_TOKEN_FILE"]
    incluster.SERVICE_CERT_FILENAME = os.environ["TEST_SA_CA_FILE"]
    main(sys.argv[1:])
