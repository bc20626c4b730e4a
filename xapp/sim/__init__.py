"""Synthetic radio environments for tests, the E2 replay and the main job's embedded default."""
