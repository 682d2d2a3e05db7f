"""The gateway's Jupyter web layer: Enterprise Gateway's app with NotebookOS's handlers (:mod:`.gatewayapp`), who is
asking and what they may reach (:mod:`.identity`, :mod:`.authorization`), the kernel channels websocket
(:mod:`.websocket`), the REST views (:mod:`.handlers`), the dashboard, and EG's hook that starts a NotebookOS kernel
(:mod:`.processproxy`)."""
