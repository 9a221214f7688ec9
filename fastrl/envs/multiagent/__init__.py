"""Multi-agent adapters: PettingZoo's parallel and turn-based games, envpool's players."""
