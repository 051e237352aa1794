"""Development tools, never imported at run time: random-weight models of the real families' shapes."""
