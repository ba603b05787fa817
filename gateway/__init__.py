"""Control plane, discovery, scraper, config, CLI and the one composition root."""
