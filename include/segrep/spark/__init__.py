"""The Spark side: manifests and work items, the job functions, launching spark-submit, recording results."""
