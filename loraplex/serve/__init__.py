"""The composition root of ``loraplex serve``: the serve configuration, the engine side (built in
the engine process or thread), the demo bootstrap and the assembly of the HTTP server's deps."""
