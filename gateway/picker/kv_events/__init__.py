"""The engines' KV-cache events (issue 37): vLLM's ZMQ publisher's wire format (``wire``)."""
