"""djl_handlers.model"""
