"""The NotebookOS gateway: Enterprise Gateway 3.3 plus the replica routers, the scheduler and our REST API."""
