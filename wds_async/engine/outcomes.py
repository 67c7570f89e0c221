"""What an error that ends a work item becomes, and what stops reading: the engine's per-item error policy.

The user's handler (``StreamSpec.handler``, or the item's route's in an engine shared by a mix's sources) decides
for every error that ends a shard or a sample: True skips it (counted), False stops the data at that position,
raising delivers the error to the consumer there. :class:`Outcomes` applies that decision in the channel and keeps
what it implies for the readers:

* ``stopping``: the engine reads no further item (a stop or a raise, the consumer gone);
* ``ended routes``: in a shared engine, a stop or a raise, or a route whose consumer left, ends that route only:
  its items are no longer read, and the other routes go on.

A sample-level error is raised inside the reader as :class:`Stop` or :class:`HandlerRaised` (made by
:meth:`Outcomes.on_sample_error`), so that it ends the item where it happened, and reaches :meth:`Outcomes.failed`
like any other end of an item.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import WdsError
from ..stats import Stats
from ..urls import redact_url
from .channel import ChannelClosed, SampleChannel
from .failures import translate
from .spec import StreamSpec
from .work import ItemDone, WorkItem

__all__ = ["HandlerRaised", "Outcomes", "Stop"]


class Stop(Exception):
    """The handler asked to stop at this point."""


class HandlerRaised(Exception):
    """The handler raised ``error`` for a sample-level problem."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class Outcomes:
    """The per-item error policy of one engine (see the module docstring)."""

    def __init__(self, spec: StreamSpec, channel: SampleChannel, stats: Stats) -> None:
        self.spec = spec
        self.channel = channel
        self.stats = stats
        #: The engine reads no further item.
        self.stopping = False
        #: Routes whose consumer is gone or whose handler stopped them: their items are no longer read.
        self.ended_routes: set[int] = set()

    def rules(self, item: WorkItem) -> StreamSpec:
        """The spec whose handler and member rules apply to ``item``: its route's, or the engine's."""
        routes = self.spec.routes
        return routes[item.route] if routes and item.route is not None else self.spec

    def route_ended(self, item: WorkItem) -> bool:
        """``item``'s route has ended: it is not to be read."""
        return item.route is not None and item.route in self.ended_routes

    def _end(self, item: WorkItem) -> None:
        """An item's handler stopped the data, or raised: stop the engine, or only the item's route."""
        if item.route is None or not self.spec.routes:
            self.stopping = True
        else:
            self.ended_routes.add(item.route)

    def failed(self, token: object, item: WorkItem, exc: BaseException) -> None:
        """Route what ended an item: our own signals, else the error (in our tree) to the handler."""
        if isinstance(exc, ChannelClosed):
            self._gone(item)
        elif isinstance(exc, Stop):
            self.channel.put_stop(token)
            self._end(item)
        elif isinstance(exc, HandlerRaised):
            self.channel.put_error(token, exc.error)
            self._end(item)
        elif self._shard_failed(token, item, translate(exc, url=redact_url(item.url))) and not self.channel.abandoned:
            try:
                self.channel.put(token, ItemDone(item.id), 0)
            except ChannelClosed:  # the item's route was left while the handler decided: as above
                self._gone(item)

    def _gone(self, item: WorkItem) -> None:
        """The consumer of ``item`` left: the engine stops, or in a shared engine only the item's route ends (a
        mix's source whose ``with_epoch`` was reached while a skipped shard of it was being read: raised out of
        here, the closed route stopped the whole engine, and the other sources ended with an EngineError)."""
        if self.channel.abandoned or item.route is None:
            self.stopping = True
        else:
            self.ended_routes.add(item.route)  # that route's consumer left; the others go on

    def _shard_failed(self, token: object, item: WorkItem, exc: BaseException) -> bool:
        """Ask the handler about a failed item; True when it chose to skip it (and go on)."""
        try:
            keep_going = self.rules(item).handler(exc)
        except BaseException as raised:  # delivered to the consumer, not swallowed
            self.channel.put_error(token, raised)
            self._end(item)
            return False
        if keep_going:
            self.stats.shards_skipped += 1
            return True
        self.channel.put_stop(token)
        self._end(item)
        return False

    def on_sample_error(self, item: WorkItem) -> Callable[[WdsError], None]:
        """The callback the grouper calls with a sample-level error of ``item``: skipped (counted) when the
        handler says so, else raised as :class:`Stop` or :class:`HandlerRaised` to end the item there."""
        handler = self.rules(item).handler

        def on_sample_error(err: WdsError) -> None:
            try:
                keep_going = handler(err)
            except BaseException as raised:
                raise HandlerRaised(raised) from None
            if not keep_going:
                raise Stop()
            self.stats.samples_skipped += 1

        return on_sample_error
