"""A Django upload handler that streams each uploaded file straight into the S3 staging area of an upload.

Memory stays bounded by one multipart part (``ADAPTER_UPLOAD_PART_BYTES``); nothing goes to local disk.
Used by the streamed REST upload (multipart form of the files, or a raw .zip/.tar.gz body). What it staged is
in :attr:`S3StagingUploadHandler.received`, so the caller can complete or clean up the upload.
"""

from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from django.http.multipartparser import MultiPartParserError

from adapters.storage import ObjectStore, staging_key

MAX_FILES = 8  # a PEFT folder's files (two, plus a README or so) or one archive


class TooManyFiles(MultiPartParserError):
    pass


class StagedFile(UploadedFile):
    """An uploaded file whose bytes are in the object store, not here."""

    def __init__(self, name: str, size: int, key: str):
        super().__init__(file=None, name=name, content_type=None, size=size)
        self.key = key

    def close(self) -> None:
        pass  # nothing open here (Django closes every uploaded file when the request ends)


class S3StagingUploadHandler(FileUploadHandler):
    def __init__(self, request, *, store: ObjectStore, upload_uuid, part_bytes: int):
        super().__init__(request)
        self.store = store
        self.upload_uuid = upload_uuid
        self.part_bytes = part_bytes
        # {"name", "key", "size", "multipart_id"?} per file, appended before any byte is sent (for cleanup).
        self.received: list[dict] = []
        self._buffer = bytearray()
        self._parts: list[dict] = []

    def new_file(self, field_name, file_name, content_type, content_length, charset=None, content_type_extra=None):
        super().new_file(field_name, file_name, content_type, content_length, charset, content_type_extra)
        if len(self.received) >= MAX_FILES:
            raise TooManyFiles(f"an upload holds at most {MAX_FILES} files")
        self.received.append({"name": str(file_name)[:255], "key": staging_key(upload_uuid=self.upload_uuid,
                                                                              index=len(self.received)), "size": 0})
        self._buffer.clear()
        self._parts = []

    def receive_data_chunk(self, raw_data: bytes, start: int):
        self._buffer += raw_data
        self.received[-1]["size"] += len(raw_data)
        if len(self._buffer) >= self.part_bytes:
            self._flush_part()
        return None  # consumed: no other handler gets the bytes

    def _flush_part(self) -> None:
        current = self.received[-1]
        if "multipart_id" not in current:
            current["multipart_id"] = self.store.create_multipart(current["key"])
        etag = self.store.upload_part(current["key"], current["multipart_id"], len(self._parts) + 1,
                                      bytes(self._buffer))
        self._parts.append({"number": len(self._parts) + 1, "etag": etag})
        self._buffer.clear()

    def file_complete(self, file_size: int) -> StagedFile:
        current = self.received[-1]
        if "multipart_id" in current:
            if self._buffer:
                self._flush_part()
            self.store.complete_multipart(current["key"], current["multipart_id"], self._parts)
            del current["multipart_id"]
        else:
            self.store.put_bytes(current["key"], bytes(self._buffer))
        self._buffer.clear()
        return StagedFile(current["name"], current["size"], current["key"])

    def upload_interrupted(self) -> None:
        self._buffer.clear()
