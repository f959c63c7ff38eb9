"""Raw archive bodies for the streamed upload (besides multipart forms): the body is the file."""

from rest_framework.parsers import FileUploadParser


class _ArchiveParser(FileUploadParser):
    filename = ""

    def get_filename(self, stream, media_type, parser_context) -> str:
        return self.filename  # the kind of archive is told by the media type; a client name is never needed


class ZipUploadParser(_ArchiveParser):
    media_type = "application/zip"
    filename = "upload.zip"


class TarGzUploadParser(_ArchiveParser):
    media_type = "application/gzip"
    filename = "upload.tar.gz"
