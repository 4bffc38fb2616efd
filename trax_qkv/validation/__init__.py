"""The main job: built-in and plugin trained side by side, and the report."""
