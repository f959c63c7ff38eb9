"""Shapes of the schema API: outputs from the models, inputs checked here and handed to the services (which check
the document itself: schemas.documents)."""

from rest_framework import serializers

from schemas.models import MAX_DESCRIPTION, MAX_NAME_LENGTH, SCHEMA_NAME_PATTERN, Schema, SchemaVersion, name_validator


class SchemaSerializer(serializers.ModelSerializer):
    created_by = serializers.EmailField(source="created_by.email", read_only=True, allow_null=True)
    latest_version = serializers.IntegerField(read_only=True, allow_null=True,
                                              help_text="Newest ready version: what the name resolves to.")
    newest_version = serializers.IntegerField(source="newest_number", read_only=True, allow_null=True)
    newest_status = serializers.CharField(read_only=True, allow_null=True)
    num_versions = serializers.IntegerField(read_only=True)

    class Meta:
        model = Schema
        fields = ["name", "latest_version", "newest_version", "newest_status", "num_versions", "created_by",
                  "created_at", "updated_at"]
        read_only_fields = fields


class SchemaVersionSerializer(serializers.ModelSerializer):
    name = serializers.CharField(source="schema.name", read_only=True)
    version = serializers.IntegerField(source="number", read_only=True)
    schema = serializers.JSONField(source="document", read_only=True)
    created_by = serializers.EmailField(source="created_by.email", read_only=True, allow_null=True)

    class Meta:
        model = SchemaVersion
        fields = ["name", "version", "status", "failure_code", "failure_reason", "schema", "description", "strict",
                  "warm_replicas", "compile_ms", "compiled_at", "created_by", "created_at"]
        read_only_fields = fields


class SchemaVersionCreateSerializer(serializers.Serializer):
    schema = serializers.JSONField(help_text="The JSON Schema (an object): at most 64 KiB and 32 levels deep.")
    description = serializers.CharField(max_length=MAX_DESCRIPTION, required=False, allow_blank=True, default="",
                                        help_text="Sent as json_schema.description unless the request has one.")
    strict = serializers.BooleanField(required=False, default=False,
                                      help_text="Sent as json_schema.strict unless the request has one; the engine "
                                                "enforces the schema either way.")


class SchemaCreateSerializer(SchemaVersionCreateSerializer):
    name = serializers.RegexField(f"^{SCHEMA_NAME_PATTERN}$", max_length=MAX_NAME_LENGTH,
                                  error_messages={"invalid": name_validator.message},
                                  help_text="Letters, digits, '_', '-' (OpenAI's json_schema name rule).")
