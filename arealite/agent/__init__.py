"""Agentic RL: an OpenAI-compatible proxy that records an agent's chat calls as trajectories."""
