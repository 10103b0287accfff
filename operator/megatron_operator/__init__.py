"""MegatronJob operator: API, layout planner, renderer, policy, and the kopf operator."""
