"""The SageMaker backend: request builders, the Pipes client for Training and Processing jobs, FSx warm state."""
