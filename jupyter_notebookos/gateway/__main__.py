"""``python -m jupyter_notebookos.gateway``: start the NotebookOS gateway."""

from jupyter_notebookos.gateway.web.gatewayapp import launch_instance

if __name__ == "__main__":
    launch_instance()
