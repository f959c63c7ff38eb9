"""Shapes of the adapter API: outputs from the models, inputs checked here and handed to the services."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from adapters.models import Adapter, AdapterUpload, AdapterVersion, name_validator
from adapters.services.adapters import MAX_DESCRIPTION
from adapters.staging import MAX_FILES
from tenants.adapter_names import ADAPTER_NAME_PATTERN, MAX_NAME_LENGTH

MAX_BIGINT = 2**63 - 1


class AdapterSerializer(serializers.ModelSerializer):
    created_by = serializers.EmailField(source="created_by.email", read_only=True, allow_null=True)
    latest_version = serializers.IntegerField(read_only=True, allow_null=True,
                                              help_text="Newest ready version: what `name` resolves to.")
    num_versions = serializers.IntegerField(read_only=True)

    class Meta:
        model = Adapter
        fields = ["name", "description", "latest_version", "num_versions", "created_by", "created_at",
                  "updated_at"]
        read_only_fields = fields


class AdapterCreateSerializer(serializers.Serializer):
    name = serializers.RegexField(f"^{ADAPTER_NAME_PATTERN}$", max_length=MAX_NAME_LENGTH,
                                  error_messages={"invalid": name_validator.message},
                                  help_text="Letters, digits, '.', '_', '-'; callers use `name` or `name:version`.")
    description = serializers.CharField(max_length=MAX_DESCRIPTION, required=False, allow_blank=True, default="")


class AdapterUpdateSerializer(serializers.Serializer):
    description = serializers.CharField(max_length=MAX_DESCRIPTION, allow_blank=True)


class AdapterVersionSerializer(serializers.ModelSerializer):
    version = serializers.IntegerField(source="number", read_only=True)
    created_by = serializers.EmailField(source="created_by.email", read_only=True, allow_null=True)
    target_modules = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = AdapterVersion
        fields = ["version", "status", "failure_code", "failure_reason", "engine_id", "rank", "alpha",
                  "target_modules", "upload_bytes", "size_bytes", "sha256", "base_fingerprint", "created_by",
                  "created_at", "validated_at", "warm_loaded_at"]
        read_only_fields = fields


class UploadFileSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=255, help_text="The file's own name (adapter_config.json, "
                                 "adapter_model.safetensors, or an archive ending in .zip / .tar.gz).")
    size = serializers.IntegerField(min_value=0, max_value=MAX_BIGINT, help_text="Exact size in bytes.")


class UploadCreateSerializer(serializers.Serializer):
    files = UploadFileSerializer(many=True, min_length=1, max_length=MAX_FILES)


class UploadTargetSerializer(serializers.Serializer):
    name = serializers.CharField()
    size = serializers.IntegerField()
    part_sizes = serializers.ListField(child=serializers.IntegerField(),
                                       help_text="The exact length each URL accepts, in order.")
    urls = serializers.ListField(child=serializers.URLField(),
                                 help_text="PUT each part's bytes to its URL (no other headers needed).")


class UploadSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="uuid", read_only=True)
    version = serializers.IntegerField(source="version.number", read_only=True, allow_null=True)
    files = serializers.SerializerMethodField()

    class Meta:
        model = AdapterUpload
        fields = ["id", "status", "presigned", "declared_bytes", "files", "version", "created_at", "expires_at",
                  "finished_at"]
        read_only_fields = fields

    @extend_schema_field(UploadFileSerializer(many=True))
    def get_files(self, upload: AdapterUpload) -> list[dict]:
        return [{"name": f["name"], "size": f["size"]} for f in upload.files]


class UploadCreatedSerializer(serializers.Serializer):
    upload = UploadSerializer()
    targets = UploadTargetSerializer(many=True)


class UploadFormSerializer(serializers.Serializer):
    """The streamed upload as a multipart form (a raw application/zip or application/gzip body works too)."""

    files = serializers.ListField(child=serializers.FileField(), min_length=1, max_length=MAX_FILES,
                                  help_text="adapter_config.json and adapter_model.safetensors, or one archive.")


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField()
    detail = serializers.CharField()
    attr = serializers.CharField(allow_null=True)


class ErrorResponseSerializer(serializers.Serializer):
    type = serializers.CharField(help_text="client_error or server_error")
    errors = ErrorDetailSerializer(many=True)
