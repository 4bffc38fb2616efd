"""The main job: the built-in and trax_qkv side by side, and its report."""
