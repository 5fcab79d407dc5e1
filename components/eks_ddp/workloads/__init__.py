"""Per-run Kubernetes objects (they take the Kubernetes provider from opts)."""
