"""Which attention the layers of trax.models' Transformers use."""
