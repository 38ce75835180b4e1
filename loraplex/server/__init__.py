"""The HTTP server: OpenAI-compatible routes, the admin API, error mapping and metrics.

``create_app(ServerDeps)`` builds the FastAPI app; ``assembly.build_server`` builds the deps for
``loraplex serve``.
"""
