"""metarl: discover reinforcement-learning objectives by evolution."""
