"""The capacity planner: simulated deployments swept, judged against objectives, priced per
correct request (``qualify.cost``); the cheapest that meets the objectives wins."""
