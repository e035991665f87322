# The node's instance role: objects under s3://BUCKET/PREFIX/ and nothing else. Silt reads its
# credentials from the instance metadata service (IMDSv2).

data "aws_iam_policy_document" "assume_ec2" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "silt" {
  name_prefix        = "${var.name}-node-"
  description        = "Silt node: objects under s3://${aws_s3_bucket.silt.bucket}/${var.object_prefix}/"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
}

data "aws_iam_policy_document" "silt_objects" {
  # Segments, tail objects, the manifest (conditional creates are PUTs), lakehouse files; HEAD
  # is GetObject. Multipart uploads are PutObject, their abort is its own action.
  statement {
    sid       = "ObjectsUnderPrefix"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    resources = ["${aws_s3_bucket.silt.arn}/${var.object_prefix}/*"]
  }

  # Listing (recovery, retention, the orphan sweep), only with a key prefix under ours.
  statement {
    sid       = "ListUnderPrefix"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.silt.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.object_prefix}/*"]
    }
  }

  # The start-up sweep lists incomplete multipart uploads under PREFIX/segments/ to abort the
  # ones an earlier node left. S3 has no prefix condition for this action: it is granted on the
  # bucket, and shows upload keys and ids only, never data (the abort itself stays in PREFIX/).
  statement {
    sid       = "ListMultipartUploads"
    actions   = ["s3:ListBucketMultipartUploads"]
    resources = [aws_s3_bucket.silt.arn]
  }
}

resource "aws_iam_role_policy" "silt_objects" {
  name   = "silt-objects"
  role   = aws_iam_role.silt.id
  policy = data.aws_iam_policy_document.silt_objects.json
}

resource "aws_iam_instance_profile" "silt" {
  name_prefix = "${var.name}-node-"
  role        = aws_iam_role.silt.name
}
