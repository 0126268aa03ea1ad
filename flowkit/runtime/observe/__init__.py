"""What a worker tells its operator: scrape-time metrics, the console, log budgets."""
