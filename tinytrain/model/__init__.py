"""The model the run trains: Hugging Face model building, the LightningModule and its losses
(chunked, liger), packed attention for flash-attn, tensor-parallel sharding, init_from weights."""
