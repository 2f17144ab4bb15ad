"""Scenes: ingestion of a user's meshes, and the bundled procedural demo scenes."""
