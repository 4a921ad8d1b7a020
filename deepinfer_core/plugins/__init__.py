"""Plugin system: hook specs, the plugin-manager factory and hook resolution."""
