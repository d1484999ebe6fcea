"""The Responses API side: the typed request, the Response object, statuses, usage and turn
metrics, and the event state machine."""
