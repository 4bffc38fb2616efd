"""The main job: the built-in and trax_qkv trained side by side, and the report."""
