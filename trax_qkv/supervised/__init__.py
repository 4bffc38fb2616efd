"""Training with exact resume, decoding and scoring of translation models."""
