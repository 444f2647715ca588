"""Test helpers: databases on both backends, a live API server, signed sample documents."""
