# The bucket is Silt's durable store: sealed segments, the manifest, sessions, offsets and the
# lakehouse tables, all under var.object_prefix. Private, encrypted at rest, TLS only.

resource "aws_s3_bucket" "silt" {
  bucket        = var.bucket_name
  bucket_prefix = var.bucket_name == null ? "${var.name}-" : null
  force_destroy = var.force_destroy_bucket
}

resource "aws_s3_bucket_public_access_block" "silt" {
  bucket = aws_s3_bucket.silt.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "silt" {
  bucket = aws_s3_bucket.silt.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

# SSE-S3: no KMS key for the instance role to be granted.
resource "aws_s3_bucket_server_side_encryption_configuration" "silt" {
  bucket = aws_s3_bucket.silt.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

# Versioning stays off: Silt never overwrites a segment, and its manifest keeps its own versions
# (conditional creates), so old object versions would only be billed.

# A crash in the middle of a segment upload leaves its parts behind, billed until aborted. Silt
# aborts those of earlier nodes at start-up; this rule catches the rest (a prefix given up).
resource "aws_s3_bucket_lifecycle_configuration" "silt" {
  bucket = aws_s3_bucket.silt.id

  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_multipart_days
    }
  }
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid       = "DenyPlainHttp"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.silt.arn, "${aws_s3_bucket.silt.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "silt" {
  bucket = aws_s3_bucket.silt.id
  policy = data.aws_iam_policy_document.bucket.json

  # S3 refuses a bucket policy while the public access block is being put.
  depends_on = [aws_s3_bucket_public_access_block.silt]
}
