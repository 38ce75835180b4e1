"""The fleet: loraplex engine replicas on Ray Serve behind one ingress (``docs/fleet.md``)."""
