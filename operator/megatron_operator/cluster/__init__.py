"""The Kubernetes shell: the only importer of kopf and the Kubernetes client."""
