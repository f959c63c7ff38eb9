"""The answer to a path under /api/ that names no endpoint: the API's JSON 404, not Django's HTML page."""

from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.views import APIView


@extend_schema(exclude=True)
class APINotFoundView(APIView):
    authentication_classes = []
    permission_classes = []

    def initial(self, request, *args, **kwargs):
        raise NotFound(f"No API endpoint at {request.path} (the API's endpoints: /api/schema/).")
