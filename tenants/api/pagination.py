"""Limit/offset pagination with bounds, so no query string can ask the database for an out-of-range OFFSET."""

from rest_framework.pagination import LimitOffsetPagination, _positive_int

MAX_OFFSET = 1_000_000


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = 500

    def get_offset(self, request) -> int:
        try:
            return _positive_int(request.query_params[self.offset_query_param], cutoff=MAX_OFFSET)
        except (KeyError, ValueError):
            return 0
