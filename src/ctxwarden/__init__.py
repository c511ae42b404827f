"""ctxwarden."""
