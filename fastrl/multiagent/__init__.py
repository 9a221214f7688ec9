"""Many agents and policies: the agent-to-policy map, self-play's league, scripted opponents."""
