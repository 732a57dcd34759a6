"""The server builds its channel layer at start, not on the first request's event loop."""

from __future__ import annotations

from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers

from sectr_web import asgi


def test_warm_up_builds_the_channel_layer() -> None:
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
    asgi.warm_up()
    assert DEFAULT_CHANNEL_LAYER in channel_layers.backends
    assert asgi.get_channel_layer() is channel_layers.backends[DEFAULT_CHANNEL_LAYER]
