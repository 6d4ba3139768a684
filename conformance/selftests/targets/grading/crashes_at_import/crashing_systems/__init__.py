raise RuntimeError("crashing_systems: no config.yaml next to the package (a repository that crashes at import)")
