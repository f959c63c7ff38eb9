"""People: sign-in with Django's auth, accounts (operators), memberships and invitations of a tenant."""

from django.contrib.auth import authenticate, get_user_model, login, logout, update_session_auth_hash
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.parsers import JSONParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants import selectors, services
from tenants.access import access_tenant, require_operator
from tenants.api.authentication import KeyPrincipal
from tenants.api.filters import MembershipFilter
from tenants.api.serializers import (
    InvitationAcceptSerializer,
    InvitationCreatedSerializer,
    InvitationCreateSerializer,
    InvitationSerializer,
    LoginSerializer,
    MembershipCreateSerializer,
    MembershipSerializer,
    MembershipUpdateSerializer,
    MeSerializer,
    PasswordChangeSerializer,
    UserCreateSerializer,
    UserSerializer,
    validated,
)
from tenants.models import Invitation, Membership, Role


class MeView(APIView):
    @extend_schema(responses=MeSerializer)
    def get(self, request):
        user = request.user
        if isinstance(user, KeyPrincipal):
            tenant = user.key.tenant
            mine = {"tenant": tenant.slug, "name": tenant.name, "role": Role.ADMIN}
            return Response({"user": None, "memberships": [mine]})
        memberships = user.memberships.select_related("tenant").order_by("tenant__slug")
        return Response({
            "user": UserSerializer(user).data,
            "memberships": [{"tenant": m.tenant.slug, "name": m.tenant.name, "role": m.role} for m in memberships],
        })


class LoginView(APIView):
    """Start a session (cookie) for the web UI and the browsable API. JSON bodies only: with no session yet there is
    no CSRF check, and a cross-site form (urlencoded, multipart or text/plain, all sent without a preflight) must
    not be able to sign a victim into the sender's account."""

    permission_classes = [AllowAny]
    authentication_classes = []
    parser_classes = [JSONParser]

    @extend_schema(request=LoginSerializer, responses={200: UserSerializer})
    def post(self, request):
        data = validated(LoginSerializer, request.data)
        user = authenticate(request, username=data["email"], password=data["password"])
        if user is None:
            raise ValidationError("Wrong email or password.")
        login(request, user)
        return Response(UserSerializer(user).data)


class LogoutView(APIView):
    @extend_schema(request=None, responses={204: None})
    def post(self, request):
        logout(request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class PasswordChangeView(APIView):
    @extend_schema(request=PasswordChangeSerializer, responses={204: None})
    def post(self, request):
        if isinstance(request.user, KeyPrincipal):
            raise PermissionDenied("A key has no password.")
        data = validated(PasswordChangeSerializer, request.data)
        services.user_change_password(user=request.user, old_password=data["old_password"],
                                      new_password=data["new_password"])
        update_session_auth_hash(request, request.user)  # keep this session signed in
        return Response(status=status.HTTP_204_NO_CONTENT)


class UserListView(generics.ListAPIView):
    """Accounts (operators only). Operators create accounts; tenant admins invite people instead."""

    queryset = get_user_model().objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = UserSerializer

    def get_queryset(self):
        require_operator(self.request)
        return get_user_model().objects.order_by("email", "id")

    @extend_schema(request=UserCreateSerializer, responses={201: UserSerializer})
    def post(self, request):
        require_operator(request)
        data = validated(UserCreateSerializer, request.data)
        user = services.user_create(email=data["email"], password=data.get("password"), is_staff=data["is_staff"])
        return Response(UserSerializer(user).data, status=status.HTTP_201_CREATED)


class MembershipListView(generics.ListAPIView):
    queryset = Membership.objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = MembershipSerializer
    filterset_class = MembershipFilter

    def get_queryset(self):
        return selectors.membership_list(tenant=access_tenant(self.request, self.kwargs["slug"]).tenant)

    @extend_schema(request=MembershipCreateSerializer, responses={201: MembershipSerializer})
    def post(self, request, slug: str):
        """Add an existing account (operators); tenant admins invite instead."""
        access = access_tenant(request, slug, need=selectors.OPERATOR)
        data = validated(MembershipCreateSerializer, request.data)
        user = get_user_model().objects.filter(email__iexact=data["email"]).order_by("id").first()
        if user is None:
            raise ValidationError({"email": f"No account for {data['email']}; create it or send an invitation."})
        membership = services.membership_add(tenant=access.tenant, user=user, role=data["role"])
        return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)


class MembershipDetailView(APIView):
    def _membership(self, request, slug: str, pk: int):
        access = access_tenant(request, slug, need=Role.ADMIN)
        return access, get_object_or_404(selectors.membership_list(tenant=access.tenant), pk=pk)

    @extend_schema(request=MembershipUpdateSerializer, responses=MembershipSerializer)
    def patch(self, request, slug: str, pk: int):
        access, membership = self._membership(request, slug, pk)
        data = validated(MembershipUpdateSerializer, request.data)
        membership = services.membership_set_role(tenant=access.tenant, membership=membership, role=data["role"])
        return Response(MembershipSerializer(membership).data)

    @extend_schema(responses={204: None})
    def delete(self, request, slug: str, pk: int):
        access, membership = self._membership(request, slug, pk)
        services.membership_remove(tenant=access.tenant, membership=membership)
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationListView(generics.ListAPIView):
    queryset = Invitation.objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = InvitationSerializer

    def get_queryset(self):
        access = access_tenant(self.request, self.kwargs["slug"], need=Role.ADMIN)
        return selectors.invitation_list(tenant=access.tenant)

    @extend_schema(request=InvitationCreateSerializer, responses={201: InvitationCreatedSerializer})
    def post(self, request, slug: str):
        """Invite someone: the invitee gets the accept link by email; the response carries the token once."""
        access = access_tenant(request, slug, need=Role.ADMIN)
        data = validated(InvitationCreateSerializer, request.data)
        inviter = None if isinstance(request.user, KeyPrincipal) else request.user
        invitation, token = services.invitation_create(
            tenant=access.tenant, email=data["email"], role=data["role"], invited_by=inviter,
            link_for=lambda token: request.build_absolute_uri(reverse("console:invitation-accept", args=[token])))
        invitation.token = token
        return Response(InvitationCreatedSerializer(invitation).data, status=status.HTTP_201_CREATED)


class InvitationDetailView(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request, slug: str, pk: int):
        access = access_tenant(request, slug, need=Role.ADMIN)
        invitation = get_object_or_404(selectors.invitation_list(tenant=access.tenant), pk=pk)
        services.invitation_revoke(tenant=access.tenant, invitation=invitation)
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationAcceptView(APIView):
    """Join with an invitation token: as the signed-in person, or as a new account with a password."""

    permission_classes = [AllowAny]

    @extend_schema(request=InvitationAcceptSerializer, responses={201: MembershipSerializer})
    def post(self, request):
        data = validated(InvitationAcceptSerializer, request.data)
        user = request.user if request.user.is_authenticated else None
        if isinstance(user, KeyPrincipal):
            raise PermissionDenied("A key cannot accept invitations.")
        membership = services.invitation_accept(token=data["token"], user=user, password=data.get("password"))
        return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)
