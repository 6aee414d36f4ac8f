"""The lifecycle diagrams (Mermaid, Graphviz) drawn from the transition table."""
