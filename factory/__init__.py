"""ai-factory: typed configuration, capacity planner, root component and offline tools."""
