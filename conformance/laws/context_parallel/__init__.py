"""Laws of context parallelism (ring attention): merge algebra, layouts, ring parity,
communication and causal work.  ``laws.LAWS`` lists them."""
