"""`agentstream demo --learn`: the whole loop on one machine, with a held-out evaluation per version."""
