"""Recipes: agents written on popular frameworks, recorded by agent-blackbox (each
module is the code of one recipe in ``docs/recipes/``)."""
