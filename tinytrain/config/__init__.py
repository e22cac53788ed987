"""Structured-config schemas (registered in Hydra's ConfigStore) and OmegaConf resolvers."""
