"""Starting processes that must not outlive their starter: the demo's and ``lifecycle.testing``'s launcher."""
