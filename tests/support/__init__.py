"""What the tests share: small envs, reference implementations, script loaders."""
