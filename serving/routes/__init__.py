"""The LLM app's HTTP face: the ingress deployment and every route it serves.

    ingress.py    HttpIngress: the Serve deployment, composed of the Ingress (serving/llm/) and
                  the OfflineLane (serving/batch/); declares all routes and the handle API
    batch_api.py  the answers of /v1/files and /v1/batches, on the lane
    upload.py     reading an upload: a capped body, multipart/form-data
    lane_host.py  IngressLaneHost: what the lane asks of the ingress, on its public surface

The only package that imports both serving/llm/ and serving/batch/ (serving/app.py builds it).
"""
